# Remote KV tier (base/remote.c) against real redis-server: one node on a free loopback
# port, and a 3-master cluster started by tests/redis_cluster.sh (exit 77 = skipped when
# redis-server or redis-cli is missing).
if(TARGET cg_remote)
  cg_check_test(NAME test_remote SOURCES test_remote.c LIBS cg_remote cg_kv cg_test_harness TIMEOUT 240)
  set_tests_properties(test_remote PROPERTIES SKIP_RETURN_CODE 77)
endif()
