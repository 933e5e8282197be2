# The gateway's routing rule (server/workers.c: cg_route_pick), a unit suite, and the load that
# workers report to every gateway replica, with real workers and gateways.
cg_check_test(NAME test_routing SOURCES test_routing.c LIBS cg_server
              PROGRAMS chunkgate chunkgate-worker)
