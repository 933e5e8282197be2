# Model generator presets (tiny pinned bytes, Llama/Qwen2/Qwen3 checkpoints, shards, tokenizer
# checks, generate-model command line).
cg_check_test(NAME test_modelgen SOURCES test_modelgen.c LIBS cg_wserve TIMEOUT 300)
if(TARGET chunkgate-worker)
  add_dependencies(test_modelgen chunkgate-worker)
endif()
