// sd-cli's --tensor-type-rules "PATTERN=TYPE,PATTERN=TYPE": the type of the
// weight matrices whose names match a pattern, so that one run can keep the
// VAE in F16 while the diffusion model goes to Q4_K ("^vae\.=f16,
// model\.diffusion_model\.=q4_K"). A pattern is an ECMAScript regular
// expression searched anywhere in a name (std::regex_search, as sd-cli
// does); the first rule that matches decides, and a matrix no rule matches
// takes --type (else its file's type). The types are --type's.
//
// A rule follows compute_type's rule for --type (tensor_convert.h): vectors
// stay F32, rows that do not fill the type's blocks keep their float type,
// and a tensor stored quantized keeps its quantization.
//
// Where sd-cli warns and goes on, kiln refuses a malformed rule, an unknown
// type or a pattern that is not a regular expression: a rule silently
// dropped would quantize what the user meant to keep.
#pragma once

#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "ggml.h"
#include "util/result.h"

namespace kiln::io {

class TensorTypeRules {
  public:
    // No rules.
    TensorTypeRules() = default;
    // Errors are usage errors naming --tensor-type-rules and the entry.
    static Result<TensorTypeRules> parse(std::string_view text);

    bool empty() const { return !rules_ || rules_->empty(); }
    size_t size() const { return rules_ ? rules_->size() : 0; }
    // The rule as written ("^vae\.=f16").
    const std::string& text(size_t rule) const { return (*rules_)[rule].text; }
    ggml_type type(size_t rule) const { return (*rules_)[rule].type; }

    // The first rule whose pattern is found in any of `names` (the spellings
    // of one tensor's name), or nullopt.
    std::optional<size_t> match(const std::vector<std::string>& names) const;

  private:
    struct Rule {
        std::string text;
        std::regex pattern;
        ggml_type type;
    };
    // Shared: every module's weights hold the rules, which never change.
    std::shared_ptr<const std::vector<Rule>> rules_;
};

// How one module's weights are typed: --type, --tensor-type-rules, and the
// spellings the rules see each of the module's tensor names under besides
// its name in the file: prefixes put before the name within the module
// ("model.diffusion_model.", "unet."; see pipeline::Model::create_network).
struct WeightTypeRequest {
    std::optional<ggml_type> all;  // --type
    TensorTypeRules rules;
    std::vector<std::string> module_prefixes;
};

}  // namespace kiln::io
