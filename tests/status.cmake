# Status page suite: real chunkgate + chunkgate-worker, GET /v1/stats, and GET / rendered by
# headless Chromium (exit 77 = skipped when chromium is not installed).
if(TARGET chunkgate-worker AND TARGET chunkgate)
  cg_check_test(NAME test_status SOURCES test_status.c LIBS cg_cache TIMEOUT 300
                PROGRAMS chunkgate chunkgate-worker)
  set_tests_properties(test_status PROPERTIES SKIP_RETURN_CODE 77)
endif()
