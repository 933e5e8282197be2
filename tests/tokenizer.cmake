# Suites of the worker's tokenizer (worker/model/tokenizer*.c). test_tokenizer needs nothing but
# the files in tests/data; test_tokenizer_parity compares the real tokenizers of tests/ref's npm
# packages with @lenml/tokenizers through node and exits 77 (skipped, with the reason) when node
# or the packages are missing (scripts/test.sh runs `npm ci` in tests/ref).
cg_check_test(NAME test_tokenizer SOURCES test_tokenizer.c LIBS cg_wmodel TIMEOUT 300)
add_test(NAME test_tokenizer_parity COMMAND test_tokenizer --parity)
set_tests_properties(test_tokenizer_parity PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300
  ENVIRONMENT "CK_DEFAULT_TIMEOUT=300")
