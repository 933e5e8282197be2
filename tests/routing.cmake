# The gateway's routing rule (server/workers.c: cg_route_pick), a unit suite.
cg_check_test(NAME test_routing SOURCES test_routing.c LIBS cg_server)
