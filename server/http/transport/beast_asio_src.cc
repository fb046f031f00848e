// The compiled parts of Boost.Asio, Asio's OpenSSL layer and Boost.Beast, once for the whole
// library (BOOST_ASIO_SEPARATE_COMPILATION / BOOST_BEAST_SEPARATE_COMPILATION, set on the target
// and on everything that links it): every other file includes only their declarations.
// Built by the flux2_http_transport target; tested by tests/server/http_transport_test.cc.
#include <boost/asio/impl/src.hpp>
#include <boost/asio/ssl/impl/src.hpp>
#include <boost/beast/src.hpp>
