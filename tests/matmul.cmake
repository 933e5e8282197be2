# Weight products (worker/model/matmul.c): the suite runs every ISA variant the CPU has; the
# second run checks that CG_MATMUL_ISA caps the variant chosen at start-up.
cg_check_test(NAME test_matmul SOURCES test_matmul.c LIBS cg_wmodel)
add_test(NAME test_matmul_env_generic COMMAND test_matmul)
set_tests_properties(test_matmul_env_generic PROPERTIES TIMEOUT 120
  ENVIRONMENT "CK_RUN_CASE=isa env;CG_MATMUL_ISA=generic;OMP_WAIT_POLICY=passive")
