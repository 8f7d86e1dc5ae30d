// GET /openapi.json (tools/server/openapi.json, written by hand) held to what
// the server does: its paths are the native routes, each answers on a real
// server with a status it lists and a body its schema allows, every field of
// a job it documents is one the parser reads (a wrong type is a 400 naming
// it) and every field the parser reads is documented, and its examples make
// a job that runs on the tiny SD1 model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <set>

#include "server_test_support.h"
#include "test_files.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using test::body_json;
using test::error_param;
using test::json;
using test::ServerProcess;

// The native API's routes (tools/server/native_api.cpp), /health and the document itself.
const std::set<std::string> kDocumentedPaths = {"/kiln/v1/jobs",
                                                "/kiln/v1/jobs/{id}",
                                                "/kiln/v1/jobs/{id}/cancel",
                                                "/kiln/v1/jobs/{id}/events",
                                                "/kiln/v1/results/{id}/{index}.{format}",
                                                "/kiln/v1/models",
                                                "/kiln/v1/plan",
                                                "/kiln/v1/gallery",
                                                "/kiln/v1/gallery/{file}",
                                                "/kiln/v1/memory",
                                                "/health",
                                                "/openapi.json"};

// Every field parse_native (tools/server/native_api.cpp) reads, with those of
// read_model_parts, read_hires ("hires.NAME") and read_step_cache
// (tools/server/request_fields.cpp). Update it with the parser: a field read
// there and missing from the document fails EveryFieldTheParserReadsIsDocumented.
const std::set<std::string> kParsedFields = {"model",
                                             "video_frames",
                                             "fps",
                                             "vae",
                                             "clip_l",
                                             "clip_g",
                                             "t5xxl",
                                             "llm",
                                             "prompt",
                                             "negative_prompt",
                                             "width",
                                             "height",
                                             "steps",
                                             "batch_count",
                                             "cfg_scale",
                                             "eta",
                                             "seed",
                                             "sampler",
                                             "scheduler",
                                             "strength",
                                             "hires",
                                             "hires.enabled",
                                             "hires.upscaler",
                                             "hires.scale",
                                             "hires.target_width",
                                             "hires.target_height",
                                             "hires.steps",
                                             "hires.denoising_strength",
                                             "hires.custom_sigmas",
                                             "hires.upscale_tile_size",
                                             "init_image",
                                             "mask",
                                             "output_format",
                                             "preview",
                                             "preview_interval",
                                             "preview_noisy",
                                             "cache_mode",
                                             "cache_option",
                                             "scm_mask",
                                             "scm_policy",
                                             "scm_policy_dynamic"};

// What a field needs beside it to be read, or to take its values:
// sd-server's clients send scm_policy_dynamic with every request, so it
// counts only with a mask; a steps computation policy is for a block cache.
const std::map<std::string, json> kNeedsBeside = {{"scm_policy_dynamic", {{"scm_mask", "1,1"}}},
                                                  {"scm_policy", {{"cache_mode", "dbcache"}}}};

json fetch_document(httplib::Client& client) {
    auto r = client.Get("/openapi.json");
    if (!r || r->status != 200) return json();
    return json::parse(r->body, nullptr, false);
}

// `schema` with its $ref followed (within the document).
const json& resolved(const json& doc, const json& schema) {
    if (!schema.is_object() || !schema.contains("$ref")) return schema;
    const std::string ref = schema["$ref"];
    EXPECT_EQ(ref.rfind("#/", 0), 0u) << ref;
    const json& target = doc.at(json::json_pointer(ref.substr(1)));
    return resolved(doc, target);
}

bool has_type(const json& value, const std::string& type) {
    if (type == "null") return value.is_null();
    if (type == "boolean") return value.is_boolean();
    if (type == "integer") return value.is_number_integer();
    if (type == "number") return value.is_number();
    if (type == "string") return value.is_string();
    if (type == "array") return value.is_array();
    if (type == "object") return value.is_object();
    return false;
}

// What a reply holds against the schema the document gives for it: types,
// enums, ranges, required properties, and no property it does not describe.
void expect_matches(const json& doc, const json& schema_or_ref, const json& value, const std::string& where) {
    const json& schema = resolved(doc, schema_or_ref);
    if (schema.contains("type")) {
        const json types = schema["type"].is_array() ? schema["type"] : json::array({schema["type"]});
        bool any = false;
        for (const json& t : types) any = any || has_type(value, t.get<std::string>());
        if (!any) {
            ADD_FAILURE() << where << ": " << value.dump() << " is not " << types.dump();
            return;
        }
    }
    if (schema.contains("enum") &&
        std::find(schema["enum"].begin(), schema["enum"].end(), value) == schema["enum"].end()) {
        ADD_FAILURE() << where << ": " << value.dump() << " is none of " << schema["enum"].dump();
    }
    if (value.is_number() && schema.contains("minimum"))
        EXPECT_GE(value.get<double>(), schema["minimum"].get<double>()) << where;
    if (value.is_number() && schema.contains("maximum"))
        EXPECT_LE(value.get<double>(), schema["maximum"].get<double>()) << where;
    if (value.is_object()) {
        for (const json& name : schema.value("required", json::array())) {
            EXPECT_TRUE(value.contains(name.get<std::string>())) << where << " lacks " << name;
        }
        if (schema.contains("properties")) {
            for (const auto& [key, item] : value.items()) {
                if (!schema["properties"].contains(key)) {
                    ADD_FAILURE() << where << "." << key << " is not documented";
                    continue;
                }
                expect_matches(doc, schema["properties"][key], item, where + "." + key);
            }
        }
    }
    if (value.is_array() && schema.contains("items")) {
        for (size_t i = 0; i < value.size(); ++i) {
            expect_matches(doc, schema["items"], value[i], where + "[" + std::to_string(i) + "]");
        }
    }
}

const json& job_request_schema(const json& doc) {
    return resolved(doc, doc["paths"]["/kiln/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]["schema"]);
}

// The documented fields of a job, an object's own fields as "hires.scale", each with its schema.
std::map<std::string, json> documented_fields(const json& doc) {
    std::map<std::string, json> fields;
    for (const auto& [name, property] : job_request_schema(doc)["properties"].items()) {
        const json& schema = resolved(doc, property);
        fields[name] = property;
        if (!schema.contains("properties")) continue;
        for (const auto& [inner, inner_property] : schema["properties"].items()) {
            fields[name + "." + inner] = inner_property;
        }
    }
    return fields;
}

// `value` at a field's place in a body ("hires.scale": {"hires": {"scale": value}}).
json body_with(const std::string& field, const json& value) {
    const size_t dot = field.find('.');
    if (dot == std::string::npos) return {{field, value}};
    return {{field.substr(0, dot), {{field.substr(dot + 1), value}}}};
}

// A job of every documented field's example: objects from their fields' examples.
json job_of_examples(const json& doc) {
    json job = json::object();
    for (const auto& [name, property] : job_request_schema(doc)["properties"].items()) {
        const json& schema = resolved(doc, property);
        EXPECT_TRUE(property.contains("example") || schema.contains("example")) << name << " has no example";
        if (!schema.contains("properties")) {
            job[name] = property.value("example", schema.value("example", json()));
            continue;
        }
        json object = json::object();
        for (const auto& [inner, inner_property] : schema["properties"].items()) {
            EXPECT_TRUE(inner_property.contains("example")) << name << "." << inner << " has no example";
            object[inner] = inner_property.value("example", json());
        }
        // The object's own example is its fields' examples together.
        EXPECT_EQ(property.value("example", schema.value("example", json())), object) << name;
        job[name] = object;
    }
    return job;
}

// A value of another JSON type than the schema's.
json wrong_type_for(const json& schema) {
    const std::string type = schema.value("type", "");
    if (type == "string") return 12345;
    if (type == "integer" || type == "number") return json::object();
    if (type == "boolean") return "yes";
    if (type == "array") return "x";
    return 5;  // object
}

// A model folder with the model and parts the document's examples name, each
// the tiny SD1 checkpoint (a part of another family's is not used).
std::string model_folder_of_examples(const test::TempDir& dir, const json& doc) {
    const std::string folder = dir.file("models");
    const json job = job_of_examples(doc);
    const std::string model = folder + "/" + job["model"].get<std::string>();
    fs::create_directories(fs::path(model).parent_path());
    fs::copy_file(test::golden_path("models/sd1_tiny.safetensors"), model);
    for (const char* part : {"vae", "clip_l", "clip_g", "t5xxl", "llm"}) {
        const fs::path path = folder + "/" + job[part].get<std::string>();
        fs::create_directories(path.parent_path());
        if (!fs::exists(path)) fs::create_hard_link(model, path);
    }
    return folder;
}

TEST(ServerOpenApi, DocumentIsOpenApi31OfTheNativeRoutes) {
    ServerProcess server(test::tiny_server_flags());
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    auto r = client.Get("/openapi.json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
    const json doc = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(doc.is_object()) << r->body.substr(0, 200);
    EXPECT_EQ(doc["openapi"], "3.1.0");
    EXPECT_EQ(doc["info"]["title"], "kiln serve");
    std::set<std::string> paths;
    for (const auto& [path, item] : doc["paths"].items()) paths.insert(path);
    EXPECT_EQ(paths, kDocumentedPaths);
    EXPECT_TRUE(doc["components"]["securitySchemes"].contains("bearerAuth"));
    EXPECT_TRUE(doc["components"]["securitySchemes"].contains("apiKeyHeader"));

    // Every reference leads somewhere.
    std::function<void(const json&)> check_refs = [&](const json& node) {
        if (node.is_object() && node.contains("$ref")) {
            const std::string ref = node["$ref"];
            EXPECT_TRUE(ref.rfind("#/", 0) == 0 && doc.contains(json::json_pointer(ref.substr(1)))) << ref;
        }
        if (node.is_structured()) {
            for (const json& child : node) check_refs(child);
        }
    };
    check_refs(doc);
}

TEST(ServerOpenApi, EveryDocumentedOperationAnswersAsDocumented) {
    test::TempDir dir;
    json doc;
    {
        ServerProcess plain(test::tiny_server_flags());
        ASSERT_TRUE(plain.started()) << plain.log();
        httplib::Client plain_client("127.0.0.1", plain.port());
        doc = fetch_document(plain_client);
        ASSERT_TRUE(doc.is_object());
    }
    const std::string models = model_folder_of_examples(dir, doc);
    ServerProcess server("-t 1 " + test::tokenizer_flag() + "--model-dir " + models + " --output-dir " +
                         dir.file("outputs"));
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    client.set_read_timeout(120, 0);

    // Every example together is one job that runs, and so is each of the request's named examples.
    const json all_examples = job_of_examples(doc);
    auto accepted = client.Post("/kiln/v1/jobs", all_examples.dump(), "application/json");
    ASSERT_TRUE(accepted);
    ASSERT_EQ(accepted->status, 202) << accepted->body;
    const json& post = doc["paths"]["/kiln/v1/jobs"]["post"];
    expect_matches(doc, post["responses"]["202"]["content"]["application/json"]["schema"], body_json(accepted), "202");
    const std::string id = body_json(accepted)["id"];
    ASSERT_EQ(test::wait_for_state(client, id, "done"), "done") << server.log();
    for (const auto& [name, example] : post["requestBody"]["content"]["application/json"]["examples"].items()) {
        SCOPED_TRACE(name);
        int status = 0;
        const std::string named = test::post_job(client, example["value"], &status);
        ASSERT_EQ(status, 202);
        EXPECT_EQ(test::wait_for_state(client, named, "done"), "done") << server.log();
    }
    const json gallery = body_json(client.Get("/kiln/v1/gallery"));
    ASSERT_FALSE(gallery["images"].empty()) << gallery;

    // Each path and method, its path parameters real, its query parameters their examples.
    const std::map<std::string, std::string> path_values = {
        {"id", id}, {"index", "0"}, {"format", all_examples["output_format"]}, {"file", gallery["images"][0]["file"]}};
    const std::map<std::string, std::string> event_schemas = {
        {"queued", "QueuedEvent"}, {"started", "StartedEvent"}, {"phase", "PhaseEvent"},    {"step", "StepEvent"},
        {"done", "DoneEvent"},     {"failed", "EndedEvent"},    {"cancelled", "EndedEvent"}};
    size_t operations = 0;
    for (const auto& [path, item] : doc["paths"].items()) {
        for (const auto& [method, operation] : item.items()) {
            SCOPED_TRACE(method + " " + path);
            ++operations;
            std::string target = path;
            httplib::Params query;
            for (const json& parameter_or_ref : operation.value("parameters", json::array())) {
                const json& parameter = resolved(doc, parameter_or_ref);
                const std::string name = parameter["name"];
                if (parameter["in"] == "path") {
                    ASSERT_TRUE(path_values.count(name)) << name;
                    target.replace(target.find("{" + name + "}"), name.size() + 2, path_values.at(name));
                } else {
                    ASSERT_TRUE(parameter.contains("example")) << name;
                    const json& example = parameter["example"];
                    query.emplace(name, example.is_string() ? example.get<std::string>() : example.dump());
                }
            }
            httplib::Result r = method == "get"           ? client.Get(target, query, httplib::Headers{})
                                : path == "/kiln/v1/jobs" ? client.Post(target, all_examples.dump(), "application/json")
                                                          : client.Post(target);
            ASSERT_TRUE(r);
            EXPECT_FALSE(r->status == 404 && r->body.find("no such endpoint") != std::string::npos) << r->body;
            const std::string status = std::to_string(r->status);
            ASSERT_TRUE(operation["responses"].contains(status)) << "undocumented status " << status << ": " << r->body;
            const json& response = resolved(doc, operation["responses"][status]);
            const std::string type = r->get_header_value("Content-Type");
            ASSERT_TRUE(response["content"].contains(type)) << type << " is not documented for " << status;
            if (type == "application/json") {
                expect_matches(doc, response["content"][type]["schema"], json::parse(r->body, nullptr, false), status);
            } else if (type == "text/event-stream") {
                // "event: TYPE\ndata: JSON\n\n" each, its data as the type's schema.
                size_t events = 0;
                for (size_t at = 0; (at = r->body.find("event: ", at)) != std::string::npos; ++events) {
                    const size_t line_end = r->body.find('\n', at);
                    const std::string event = r->body.substr(at + 7, line_end - at - 7);
                    const size_t data_end = r->body.find('\n', line_end + 1);
                    const json data =
                        json::parse(r->body.substr(line_end + 7, data_end - line_end - 7), nullptr, false);
                    ASSERT_TRUE(event_schemas.count(event)) << event;
                    expect_matches(doc, doc["components"]["schemas"][event_schemas.at(event)], data, event);
                    at = data_end;
                }
                EXPECT_GT(events, 2u) << r->body;
            }
        }
    }
    EXPECT_EQ(operations, kDocumentedPaths.size() + 1);  // GET and POST /kiln/v1/jobs
}

TEST(ServerOpenApi, EveryDocumentedJobFieldIsReadAndCheckedAsDocumented) {
    ServerProcess server(test::tiny_server_flags());
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    client.set_read_timeout(120, 0);
    const json doc = fetch_document(client);
    ASSERT_TRUE(doc.is_object());

    for (const auto& [field, property] : documented_fields(doc)) {
        SCOPED_TRACE(field);
        const json& schema = resolved(doc, property);
        EXPECT_TRUE(schema.contains("description")) << field;
        const auto body_of = [&](const json& value) {
            json body = body_with(field, value);
            if (kNeedsBeside.count(field)) body.update(kNeedsBeside.at(field));
            return body;
        };
        const auto bad_is_named = [&](const json& value) {
            const json body = body_of(value);
            auto r = client.Post("/kiln/v1/jobs", body.dump(), "application/json");
            ASSERT_TRUE(r);
            EXPECT_EQ(r->status, 400) << body.dump() << " -> " << r->body;
            EXPECT_EQ(error_param(r), field) << body.dump() << " -> " << r->body;
        };
        // Taken when the request is parsed (a job that then fails is no matter
        // here: it is cancelled at once, so the queue stays short).
        const auto is_taken = [&](const json& value) {
            json body = {{"prompt", "x"}, {"width", 32}, {"height", 32}, {"steps", 1}};
            body.update(body_of(value), true);
            auto r = client.Post("/kiln/v1/jobs", body.dump(), "application/json");
            ASSERT_TRUE(r);
            EXPECT_EQ(r->status, 202) << body.dump() << " -> " << r->body;
            if (r->status == 202) client.Post("/kiln/v1/jobs/" + body_json(r)["id"].get<std::string>() + "/cancel");
        };
        // The server reads the field: a value of the wrong type is refused by its name.
        bad_is_named(wrong_type_for(schema));
        // Its documented range is the server's, ends included, and each of its documented values is taken.
        const bool integer = schema.value("type", "") == "integer";
        if (schema.contains("minimum")) {
            const double minimum = schema["minimum"];
            bad_is_named(integer ? json(static_cast<long long>(minimum) - 1)
                                 : json(minimum - 0.5 * (minimum ? std::abs(minimum) : 1)));
            is_taken(schema["minimum"]);
        }
        if (schema.contains("maximum")) {
            const json& maximum = schema["maximum"];
            bad_is_named(maximum.is_number_integer() ? json(maximum.get<unsigned long long>() + 1)
                                                     : json(maximum.get<double>() * 2));
            is_taken(maximum);
        }
        for (const json& value : schema.value("enum", json::array())) is_taken(value);
        if (schema.contains("default")) is_taken(schema["default"]);
    }
}

TEST(ServerOpenApi, EveryFieldTheParserReadsIsDocumented) {
    ServerProcess server(test::tiny_server_flags());
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    const json doc = fetch_document(client);
    ASSERT_TRUE(doc.is_object());
    const std::map<std::string, json> documented = documented_fields(doc);
    for (const std::string& field : kParsedFields)
        EXPECT_TRUE(documented.count(field)) << field << " is not documented";
    // Each documented field is read (EveryDocumentedJobFieldIsRead...), so one missing here is missing from the list.
    for (const auto& [field, schema] : documented)
        EXPECT_TRUE(kParsedFields.count(field)) << field << " is not in kParsedFields";
}

TEST(ServerOpenApi, IsPublicOnAServerWithAnApiKey) {
    ServerProcess server(test::tiny_server_flags() + " --api-key s3cret");
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    auto r = client.Get("/openapi.json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(json::parse(r->body, nullptr, false)["openapi"], "3.1.0");
    // What it describes still asks for the key.
    auto models = client.Get("/kiln/v1/models");
    ASSERT_TRUE(models);
    EXPECT_EQ(models->status, 401);
    // Only GET is public.
    auto post = client.Post("/openapi.json", "{}", "application/json");
    ASSERT_TRUE(post);
    EXPECT_EQ(post->status, 401);
}

}  // namespace
}  // namespace kiln
