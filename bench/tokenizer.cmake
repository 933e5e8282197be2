# Tokenizer encode throughput and RAG-document latency against @lenml/tokenizers in node, in the
# same run (needs `npm ci` in tests/ref).
add_executable(bench_tokenizer bench_tokenizer.c)
target_link_libraries(bench_tokenizer PRIVATE cg_wmodel cg_test_harness)
target_compile_definitions(bench_tokenizer PRIVATE CG_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
