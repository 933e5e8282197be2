# Remote tier benchmark: cg_remote_get/set of chunk-sized per-head values against raw hiredis
# GET/SET of the same bytes, same run (starts its own redis-server unless --url is given).
if(TARGET cg_remote)
  add_executable(bench_remote bench_remote.c)
  target_link_libraries(bench_remote PRIVATE cg_remote cg_kv cg_test_harness)
endif()
