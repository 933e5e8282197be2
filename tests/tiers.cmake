# Worker KV tiers: the disk tier (worker/store/disk.c + sql/kvstore.c), its write-behind
# (worker/store/diskwb.c) and the per-head KV wire format (kv/kvwire.c).
cg_check_test(NAME test_disk SOURCES test_disk.c LIBS cg_wserve)
cg_check_test(NAME test_kvwire SOURCES test_kvwire.c LIBS cg_kv)
cg_check_test(NAME test_diskwb SOURCES test_diskwb.c LIBS cg_wstore TIMEOUT 120)
# The shared KV tier on Redis and the disk write-behind, end to end: real redis-server (one
# node and a 3-master cluster), workers and gateway (exit 77 = skipped without redis-server).
if(TARGET chunkgate AND TARGET chunkgate-worker)
  cg_check_test(NAME test_shared_tier SOURCES test_shared_tier.c
                LIBS cg_wserve cg_test_redis PkgConfig::CURL TIMEOUT 300 PROGRAMS chunkgate chunkgate-worker)
  set_tests_properties(test_shared_tier PROPERTIES SKIP_RETURN_CODE 77)
endif()
# The chunk event format (base/chunkevent.h), both ways.
cg_check_test(NAME test_chunkevent SOURCES test_chunkevent.c LIBS cg_base)
# Chunk events (DESIGN §18): a worker's placement changes reach two gateways' indexes through a
# Redis Stream; a trimmed stream and a Redis outage end in a resync (exit 77 = skipped without
# redis-server).
if(TARGET chunkgate AND TARGET chunkgate-worker)
  cg_check_test(NAME test_events SOURCES test_events.c LIBS cg_test_redis PkgConfig::CURL
                TIMEOUT 400 PROGRAMS chunkgate chunkgate-worker)
  set_tests_properties(test_events PROPERTIES SKIP_RETURN_CODE 77)
endif()
