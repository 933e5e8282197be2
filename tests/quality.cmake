# Quality of reuse (DESIGN §15): selective recompute, quality probes and the background queue
# (library level, test_quality.c), and over HTTP with the real chunkgate-worker and chunkgate
# (test_quality_http.c).
cg_check_test(NAME test_quality SOURCES test_quality.c LIBS cg_test_engine TIMEOUT 600)
set_property(TEST test_quality APPEND PROPERTY ENVIRONMENT OMP_WAIT_POLICY=passive)
if(TARGET chunkgate AND TARGET chunkgate-worker)
  cg_check_test(NAME test_quality_http SOURCES test_quality_http.c LIBS cg_server TIMEOUT 300
                PROGRAMS chunkgate chunkgate-worker)
endif()
