# cg_matmul: the weight products of the forward pass (f32/f16/bf16 weights; prefill through
# OpenBLAS sgemm, batch-invariant decode kernel). Included from the top-level CMakeLists.txt.
find_package(OpenMP REQUIRED)
add_library(cg_matmul STATIC ${CMAKE_CURRENT_LIST_DIR}/matmul.c)
target_link_libraries(cg_matmul PUBLIC cg_cache PkgConfig::OPENBLAS OpenMP::OpenMP_C m)
