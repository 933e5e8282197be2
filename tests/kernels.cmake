# Kernel suites: RoPE remap, segment-aware attention, KV pool.
cg_check_test(NAME test_remap SOURCES test_remap.c LIBS cg_kv)
cg_check_test(NAME test_attn SOURCES test_attn.c LIBS cg_kv)
cg_check_test(NAME test_pool SOURCES test_pool.c LIBS cg_kv)
