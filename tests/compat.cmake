# Ecosystem checks against the real binaries. compat_openai: the official openai npm client
# (tests/compat/openai.test.js); compat_contract: answers validated against openapi/*.yaml
# with ajv; compat_lint: redocly lint of both specs; metrics_check: promtool on both
# /metrics and the Grafana dashboard's series; docker_check: docker/ validated without a
# Docker engine; entrypoint_check: docker/entrypoint.sh never touches a mounted model (needs no
# tool). The others exit 77 (reported as skipped, with the reason) when its tool is
# missing: node or the npm packages (scripts/test.sh runs `npm ci`), promtool, docker-compose.
if(TARGET chunkgate AND TARGET chunkgate-worker)
  set(CG_ECO_ENV "CHUNKGATE_BIN=$<TARGET_FILE:chunkgate>"
                 "CHUNKGATE_WORKER_BIN=$<TARGET_FILE:chunkgate-worker>" OMP_WAIT_POLICY=passive)
  foreach(t openai contract lint)
    add_test(NAME compat_${t}
             COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/compat/run.sh ${t}.test.js)
  endforeach()
  add_test(NAME metrics_check COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/metrics_check.sh)
  add_test(NAME docker_check COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/docker_check.sh)
  add_test(NAME entrypoint_check COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/entrypoint_check.sh)
  set_tests_properties(compat_openai compat_contract compat_lint metrics_check docker_check
                       entrypoint_check
    PROPERTIES ENVIRONMENT "${CG_ECO_ENV}" SKIP_RETURN_CODE 77 TIMEOUT 180)
endif()
