# Reference worker suites: the assembly engine's fidelity proofs (library level) and the HTTP
# integration test against the real chunkgate-worker process.
cg_check_test(NAME test_engine SOURCES test_engine.c LIBS cg_test_engine TIMEOUT 600)
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
if(TARGET chunkgate-worker AND EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/test_tiers_e2e.c)
  cg_check_test(NAME test_tiers_e2e SOURCES test_tiers_e2e.c LIBS cg_test_engine TIMEOUT 300
                PROGRAMS chunkgate-worker)
endif()
# test_tp also starts a gateway: several KV sources behind it, one decoding backend.
if(TARGET chunkgate-worker AND TARGET chunkgate AND EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/test_tp.c)
  cg_check_test(NAME test_tp SOURCES test_tp.c LIBS cg_test_engine TIMEOUT 300
                PROGRAMS chunkgate-worker chunkgate)
endif()
# The scheduler through the engine: batch invariance (f32 and bf16 weights), shared decode
# steps, chunked prefill between decode steps, admission, departures.
cg_check_test(NAME test_sched SOURCES test_sched.c LIBS cg_wserve TIMEOUT 600)
set_property(TEST test_sched APPEND PROPERTY ENVIRONMENT OMP_WAIT_POLICY=passive)
