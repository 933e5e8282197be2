# GGUF checkpoints: the reader, the config and tokenizer from the metadata, repacked Q8_0 / Q4_0
# blocks and the refusals, against the same checkpoints' Hugging Face files.
cg_check_test(NAME test_gguf SOURCES test_gguf.c LIBS cg_test_engine PROGRAMS chunkgate-worker
              TIMEOUT 600)
set_tests_properties(test_gguf PROPERTIES SKIP_RETURN_CODE 77)
