# Hardening suites (helper "harden"): auth and tenants, limits and slow clients, faults,
# gateway crash safety, the key hash option, one valgrind run, concurrency, and OpenAI
# conformance. Each starts the real chunkgate (and chunkgate-worker / tests/fake_backend) on
# loopback.
if(TARGET chunkgate AND TARGET chunkgate-worker AND TARGET fake_backend)
  set(CG_HARDEN_SUITES auth limits faults crash keyhash valgrind concurrency conformance)
  set(CG_HARDEN_LIBS_concurrency cg_server)
  set(CG_HARDEN_LIBS_auth cg_server)
  set(CG_HARDEN_LIBS_limits cg_server)
  set(CG_HARDEN_LIBS_faults cg_server PkgConfig::SQLITE)
  set(CG_HARDEN_LIBS_crash cg_server)
  set(CG_HARDEN_LIBS_keyhash cg_server)
  set(CG_HARDEN_LIBS_valgrind cg_server)
  set(CG_HARDEN_LIBS_conformance cg_server)
  foreach(s ${CG_HARDEN_SUITES})
    if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/test_${s}.c)
      cg_check_test(NAME test_${s} SOURCES test_${s}.c LIBS ${CG_HARDEN_LIBS_${s}} TIMEOUT 180
                    PROGRAMS chunkgate chunkgate-worker fake_backend)
      if(CG_SANITIZE OR CG_TSAN)
        # memory figures (RSS) mean nothing under ASan or TSan (shadow memory), and the
        # sanitizers and valgrind exclude each other: suites skip those checks
        target_compile_definitions(test_${s} PRIVATE CG_SANITIZE_BUILD=1)
      endif()
    endif()
  endforeach()
  if(TARGET test_concurrency)
    # the 64-client soak runs CG_SOAK_SECONDS (60 by default)
    set_tests_properties(test_concurrency PROPERTIES TIMEOUT 400)
  endif()
  if(TARGET test_valgrind)
    # 77: valgrind is not installed, or the build is instrumented (ASan and valgrind exclude
    # each other).
    set_tests_properties(test_valgrind PROPERTIES SKIP_RETURN_CODE 77)
  endif()
endif()
