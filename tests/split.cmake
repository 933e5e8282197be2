# Suites of the splitter, the chunk keys and the chat rendering (cache/split.c, key.c, chat.c).
cg_check_test(NAME test_split SOURCES test_split.c LIBS cg_cache)
cg_check_test(NAME test_key SOURCES test_key.c LIBS cg_cache)
cg_check_test(NAME test_chat SOURCES test_chat.c LIBS cg_cache)
