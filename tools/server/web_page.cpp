// The web page at / (not written yet: a placeholder that lists the APIs).
#include "server_state.h"

namespace kiln::server {

void add_web_page_route(httplib::Server& server) {
    server.Get("/", [](const httplib::Request&, httplib::Response& res) {
        res.set_content(
            "<!doctype html><title>kiln</title><h1>kiln serve</h1><p>APIs: /kiln/v1/jobs, /v1/images/generations, "
            "/sdapi/v1/txt2img. See docs/server.md.</p>",
            "text/html");
    });
}

}  // namespace kiln::server
