# The gateway's field table (server/fields.c): the lists derived from it, a unit suite.
cg_check_test(NAME test_fields SOURCES test_fields.c LIBS cg_server)
