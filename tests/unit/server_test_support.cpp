#include "server_test_support.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "test_files.h"

namespace kiln::test {

image::Image decode_base64_image(const std::string& text) {
    // Small enough to decode by hand here, independent of the server's own decoder.
    static const std::string alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::vector<uint8_t> bytes;
    uint32_t bits = 0;
    int count = 0;
    for (char c : text) {
        const auto v = alphabet.find(c);
        if (v == std::string::npos) continue;
        bits = (bits << 6) | uint32_t(v);
        if (++count == 4) {
            bytes.push_back(uint8_t(bits >> 16));
            bytes.push_back(uint8_t(bits >> 8));
            bytes.push_back(uint8_t(bits));
            bits = 0;
            count = 0;
        }
    }
    if (count == 2) bytes.push_back(uint8_t(bits >> 4));
    if (count == 3) {
        bytes.push_back(uint8_t(bits >> 10));
        bytes.push_back(uint8_t(bits >> 2));
    }
    auto img = image::decode_image(bytes.data(), bytes.size(), "reply");
    return img.ok() ? *img : image::Image{};
}

image::Image cli_image(const std::string& model_flags, const std::string& args) {
    TempDir dir;
    const std::string out = dir.file("cli.png");
    auto r = run_command(std::string(KILN_BIN) + " " + model_flags + " " + args + " -o " + out);
    if (r.exit_code != 0) return {};
    auto img = image::read_image(out);
    return img.ok() ? *img : image::Image{};
}

std::string post_job(httplib::Client& client, const json& job, int* status) {
    auto r = client.Post("/kiln/v1/jobs", job.dump(), "application/json");
    if (status) *status = r ? r->status : 0;
    return r && r->status == 202 ? body_json(r)["id"].get<std::string>() : "";
}

std::vector<ServerEvent> read_event_stream(int port, const std::string& job_id, const httplib::Headers& headers) {
    httplib::Client client("127.0.0.1", port);
    client.set_read_timeout(120, 0);
    std::vector<ServerEvent> events;
    std::string pending;
    client.Get(("/kiln/v1/jobs/" + job_id + "/events").c_str(), headers, [&](const char* data, size_t size) {
        pending.append(data, size);
        for (size_t end; (end = pending.find("\n\n")) != std::string::npos;) {
            const std::string event = pending.substr(0, end);
            pending.erase(0, end + 2);
            if (event.rfind("event: ", 0) != 0) continue;  // a ": waiting" comment
            const size_t line_end = event.find('\n');
            ServerEvent e{event.substr(7, line_end - 7), json()};
            const size_t data_at = event.find("data: ", line_end);
            if (data_at != std::string::npos) e.data = json::parse(event.substr(data_at + 6), nullptr, false);
            events.push_back(std::move(e));
        }
        return true;
    });
    return events;
}

std::vector<std::string> read_events(int port, const std::string& job_id, const httplib::Headers& headers) {
    std::vector<std::string> types;
    for (const ServerEvent& e : read_event_stream(port, job_id, headers)) types.push_back(e.type);
    return types;
}

std::string wait_for_state(httplib::Client& client, const std::string& job_id, const std::string& state) {
    std::string now;
    for (;;) {
        auto r = client.Get(("/kiln/v1/jobs/" + job_id).c_str());
        if (!r) return "no reply";
        if (r->status != 200) return "HTTP " + std::to_string(r->status);  // 404: never was, or forgotten
        now = body_json(r).value("state", "");
        if (now == state || now == "done" || now == "failed" || now == "cancelled") return now;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
}

std::string raw_status_line(int port, const std::string& request) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return "";
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    std::string reply;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
        ::send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size())) {
        char buffer[512];
        while (reply.find("\r\n") == std::string::npos) {
            const ssize_t got = ::recv(fd, buffer, sizeof buffer, 0);
            if (got <= 0) break;
            reply.append(buffer, static_cast<size_t>(got));
        }
    }
    ::close(fd);
    return reply.substr(0, reply.find("\r\n"));
}

}  // namespace kiln::test
