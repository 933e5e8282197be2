# Reference worker suites: the assembly engine's fidelity proofs (library level) and the HTTP
# integration test against the real chunkgate-worker process.
cg_check_test(NAME test_engine SOURCES test_engine.c LIBS cg_wserve TIMEOUT 600)
if(TARGET chunkgate-worker AND EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/test_worker.c)
  cg_check_test(NAME test_worker SOURCES test_worker.c LIBS cg_test_engine TIMEOUT 600
                PROGRAMS chunkgate-worker)
endif()
# libgomp's default spin-wait steals the cores OpenBLAS threads need on a 2-core machine.
set_property(TEST test_engine APPEND PROPERTY ENVIRONMENT OMP_WAIT_POLICY=passive)
if(TARGET test_worker)
  set_property(TEST test_worker APPEND PROPERTY ENVIRONMENT OMP_WAIT_POLICY=passive)
endif()
# Worker KV tiers end to end (real processes): spill/restore, restart after SIGTERM and kill -9,
# corruption, full disk. Backend role: tensor-parallel KV pulls, tp 1/2/4/8 against one source.
foreach(t test_tiers_e2e test_tp)
  if(TARGET chunkgate-worker AND EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/${t}.c)
    cg_check_test(NAME ${t} SOURCES ${t}.c LIBS cg_test_engine TIMEOUT 300
                  PROGRAMS chunkgate-worker)
  endif()
endforeach()
# The scheduler through the engine: batch invariance (f32 and bf16 weights), shared decode
# steps, chunked prefill between decode steps, admission, departures.
cg_check_test(NAME test_sched SOURCES test_sched.c LIBS cg_wserve TIMEOUT 600)
set_property(TEST test_sched APPEND PROPERTY ENVIRONMENT OMP_WAIT_POLICY=passive)
