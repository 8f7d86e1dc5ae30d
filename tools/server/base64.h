// Base64 (RFC 4648, standard alphabet) for images in JSON bodies: the native,
// OpenAI and A1111 APIs all carry images as base64 strings.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::server {

std::string base64_encode(const uint8_t* data, size_t size);
inline std::string base64_encode(const std::vector<uint8_t>& bytes) { return base64_encode(bytes.data(), bytes.size()); }

// Decodes `text`, with or without '=' padding; a "data:image/png;base64,"
// prefix (as browsers and A1111 clients send) is skipped and whitespace is
// ignored. nullopt for any other character or a truncated final group.
std::optional<std::vector<uint8_t>> base64_decode(std::string_view text);

}  // namespace kiln::server
