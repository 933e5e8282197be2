# Gateway suites: the SSE parser, the HTTP layer (in-process server on port 0), its raw framing
# check and the recv() hook that feeds it, the config table, and the integration suite that
# starts the real chunkgate against tests/fake_backend.
add_executable(fake_backend ${CMAKE_CURRENT_SOURCE_DIR}/fake_backend.c)
target_link_libraries(fake_backend PRIVATE cg_test_harness PkgConfig::MHD PkgConfig::JANSSON
                      Threads::Threads)

cg_check_test(NAME test_sse SOURCES test_sse.c LIBS cg_backends)
cg_check_test(NAME test_config SOURCES test_config.c LIBS cg_server)
cg_check_test(NAME test_http SOURCES test_http.c LIBS cg_server cg_http_recv_hook)
cg_check_test(NAME test_http_frame SOURCES test_http_frame.c LIBS cg_base)
# The recv() hook (hook/http_recv_hook.c) passes libcurl's and hiredis' reads through unchanged
# (exit 77 = skipped when redis-server is missing).
pkg_check_modules(HIREDIS REQUIRED IMPORTED_TARGET hiredis)
cg_check_test(NAME test_http_recv_hook SOURCES test_http_recv_hook.c
              LIBS cg_http_recv_hook PkgConfig::CURL PkgConfig::HIREDIS)
set_tests_properties(test_http_recv_hook PROPERTIES SKIP_RETURN_CODE 77)

cg_check_test(NAME test_gateway SOURCES test_gateway.c LIBS cg_server TIMEOUT 600
              PROGRAMS chunkgate fake_backend)
# dns_check: a worker whose name moves to another address is used again within a health
# interval (the gateway under unshare -m with its own /etc/hosts; skipped without root).
add_test(NAME dns_check COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/dns_check.sh)
set_tests_properties(dns_check PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 120
  ENVIRONMENT "CHUNKGATE_BIN=$<TARGET_FILE:chunkgate>;CHUNKGATE_WORKER_BIN=$<TARGET_FILE:chunkgate-worker>;OMP_WAIT_POLICY=passive")

# th_run must fail a run that checked nothing: a suite whose CK_RUN_CASE matches no case exits
# 1 and says why, where Check alone prints "Checks: 0" and exits 0.
add_test(NAME harness_no_test_ran
         COMMAND sh -c "out=$(CK_RUN_CASE=no-such-case \"$0\" 2>&1); rc=$?; echo \"$out\"; \
[ $rc -eq 1 ] && echo \"$out\" | grep -q 'no test ran'" $<TARGET_FILE:test_http_frame>)
