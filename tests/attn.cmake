# Attention kernel built with its run-time dispatch capped below what the machine has, so the
# scalar, SSE2 and AVX2 paths run the same suite as the default (test_attn, in kernels.cmake).
# The kernel's source is compiled into the test; cg_kv supplies the rest.
foreach(isa 0 1 2)
  cg_check_test(NAME test_attn_isa${isa} SOURCES test_attn.c ${PROJECT_SOURCE_DIR}/kv/attn.c
                LIBS cg_kv)
  target_compile_definitions(test_attn_isa${isa} PRIVATE CG_ATTN_MAX_ISA=${isa})
endforeach()
