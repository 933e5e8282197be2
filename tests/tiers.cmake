# Worker KV tiers: the disk tier (backends/reference/disk.c + sql/kvstore.c) and the per-head
# KV wire format (cache/kvwire.c).
cg_check_test(NAME test_disk SOURCES test_disk.c LIBS cg_reference)
cg_check_test(NAME test_kvwire SOURCES test_kvwire.c LIBS cg_cache)
