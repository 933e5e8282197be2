# Quantised weights (DESIGN §19): next-token log-probabilities at --quant none, q8 and q4 on the
# same ids (bench_quant), compared with llama.cpp's Q8_0 / Q4_0 by bench/quant_kl.py.
add_executable(bench_quant bench_quant.c)
target_link_libraries(bench_quant PRIVATE cg_wmodel cg_base)
