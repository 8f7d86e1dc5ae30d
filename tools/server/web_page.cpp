// The web page at /: one HTML file with its script and style inline (no
// external assets), talking to the native API (tools/server/web_page.html).
#include "server_state.h"
#include "web_page_html.h"

namespace kiln::server {

void add_web_page_route(httplib::Server& server) {
    server.Get("/", [](const httplib::Request&, httplib::Response& res) {
        res.set_header("Content-Security-Policy",
                       "default-src 'self'; img-src 'self' data: blob:; style-src 'unsafe-inline'; script-src "
                       "'unsafe-inline'");
        res.set_content(kWebPageHtml, "text/html; charset=utf-8");
    });
}

}  // namespace kiln::server
