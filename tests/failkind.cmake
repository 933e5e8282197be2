# The upstream failure kinds (server/failkind.h): one table, a unit suite.
cg_check_test(NAME test_failkind SOURCES test_failkind.c LIBS cg_server)
