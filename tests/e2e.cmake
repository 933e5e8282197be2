# End-to-end suite: the real chunkgate in front of real chunkgate-worker processes (the main
# path, routing across two workers, failures, reconciliation, admin), plus the routing rule.
if(TARGET chunkgate-worker AND TARGET chunkgate AND EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/test_e2e.c)
  cg_check_test(NAME test_e2e SOURCES test_e2e.c LIBS cg_server cg_wserve PkgConfig::CURL
                TIMEOUT 600)
  add_dependencies(test_e2e chunkgate chunkgate-worker)
  target_compile_definitions(test_e2e PRIVATE
    CHUNKGATE_BIN="$<TARGET_FILE:chunkgate>" WORKER_BIN="$<TARGET_FILE:chunkgate-worker>")
endif()
