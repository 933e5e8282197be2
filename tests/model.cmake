# Reference model suite (loader, generator, forward, tokenizer, sampling).
cg_check_test(NAME test_model SOURCES test_model.c LIBS cg_test_engine TIMEOUT 600)
