# Chat templates (cache/chat_template*.c). test_chat_template needs nothing but the
# build; test_chat_template_parity renders tests/data/chat_template_cases.json with
# @huggingface/jinja (tests/ref/render.mjs, node) and compares byte for byte, and checks the
# case mapping of every code point. It exits 77, reported as skipped with the reason, when
# node or the npm packages of tests/ref are missing (scripts/test.sh runs `npm ci` there).
cg_check_test(NAME test_chat_template SOURCES test_chat_template.c LIBS cg_cache)
add_test(NAME test_chat_template_parity COMMAND test_chat_template parity)
set_tests_properties(test_chat_template_parity PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300
  ENVIRONMENT "CK_DEFAULT_TIMEOUT=300")
