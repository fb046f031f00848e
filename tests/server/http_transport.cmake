# http_transport_tests (label "server"): the HTTP/1.1 transport over loopback with raw sockets
# against a test application (http_transport_test.cc), its pure parts (http_transport_unit_test.cc:
# messages, head checks, connection registry), and the body parsers (form_data_test.cc,
# json_body_test.cc). No model, no gRPC: it links only flux2_http_transport and flux2_http_body.
#   cmake --build build --target http_transport_tests && build/bin/http_transport_tests
add_executable(http_transport_tests
  http_transport_test.cc http_transport_unit_test.cc form_data_test.cc json_body_test.cc
  http_raw_client.cc http_test_app.cc)
target_link_libraries(http_transport_tests PRIVATE flux2_http_transport flux2_http_body
                      OpenSSL::SSL OpenSSL::Crypto GTest::gtest_main)
gtest_discover_tests(http_transport_tests PROPERTIES LABELS server TIMEOUT 300 DISCOVERY_TIMEOUT 60)
