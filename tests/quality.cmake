# Quality of reuse (DESIGN §15): selective recompute, quality probes and the background queue
# (library level, test_quality.c).
cg_check_test(NAME test_quality SOURCES test_quality.c LIBS cg_wserve TIMEOUT 600)
set_property(TEST test_quality APPEND PROPERTY ENVIRONMENT OMP_WAIT_POLICY=passive)
