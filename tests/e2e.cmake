# End-to-end suite: the real chunkgate in front of real chunkgate-worker processes (the main
# path, routing across two workers, failures, reconciliation, admin).
if(TARGET chunkgate-worker AND TARGET chunkgate AND EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/test_e2e.c)
  cg_check_test(NAME test_e2e SOURCES test_e2e.c LIBS cg_test_engine cg_cache TIMEOUT 600
                PROGRAMS chunkgate chunkgate-worker)
endif()
