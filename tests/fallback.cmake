# The fallback reasons (server/fallback.h): one table, a unit suite.
cg_check_test(NAME test_fallback SOURCES test_fallback.c LIBS cg_server)
