# Suites of the process-level parts of base/ that both programs share: the stop signals.
cg_check_test(NAME test_signals SOURCES test_signals.c LIBS cg_base TIMEOUT 60)
