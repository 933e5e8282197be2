# Suites of base/ modules both programs share: the basics (capped buffers, monotonic waits), the
# stop signals, the UTF-8 decoder, the hash map.
cg_check_test(NAME test_base SOURCES test_base.c LIBS cg_base TIMEOUT 60)
cg_check_test(NAME test_signals SOURCES test_signals.c LIBS cg_base TIMEOUT 60)
cg_check_test(NAME test_utf8 SOURCES test_utf8.c LIBS cg_base)
cg_check_test(NAME test_map SOURCES test_map.c LIBS cg_base)
