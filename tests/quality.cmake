# Quality of reuse (DESIGN §15): selective recompute, quality probes and the background queue
# (library level, test_quality.c).
cg_check_test(NAME test_quality SOURCES test_quality.c LIBS cg_wserve TIMEOUT 600)
set_property(TEST test_quality APPEND PROPERTY ENVIRONMENT OMP_WAIT_POLICY=passive)
# Over HTTP with the real chunkgate-worker and chunkgate (test_quality_http.c).
if(TARGET chunkgate AND TARGET chunkgate-worker)
  cg_check_test(NAME test_quality_http SOURCES test_quality_http.c harden_util.c
                LIBS cg_server PkgConfig::CURL TIMEOUT 300)
  add_dependencies(test_quality_http chunkgate chunkgate-worker)
  target_compile_definitions(test_quality_http PRIVATE
    CHUNKGATE_BIN="$<TARGET_FILE:chunkgate>" WORKER_BIN="$<TARGET_FILE:chunkgate-worker>")
endif()
