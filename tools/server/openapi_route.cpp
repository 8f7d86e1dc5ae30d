// GET /openapi.json: the OpenAPI 3.1 document of the native API
// (tools/server/openapi.json, written by hand and compiled in; the tests in
// tests/unit/server_openapi_test.cpp hold it to what the server does).
#include "openapi_json.h"
#include "server_state.h"

namespace kiln::server {

void add_openapi_route(httplib::Server& server) {
    server.Get("/openapi.json", [](const httplib::Request&, httplib::Response& res) {
        res.set_content(kOpenApiJson, "application/json");
    });
}

}  // namespace kiln::server
