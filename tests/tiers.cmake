# Worker KV tiers: the disk tier (worker/store/disk.c + sql/kvstore.c), its write-behind
# (worker/store/diskwb.c) and the per-head KV wire format (kv/kvwire.c).
cg_check_test(NAME test_disk SOURCES test_disk.c LIBS cg_wserve)
cg_check_test(NAME test_kvwire SOURCES test_kvwire.c LIBS cg_kv)
cg_check_test(NAME test_diskwb SOURCES test_diskwb.c LIBS cg_wstore TIMEOUT 120)
