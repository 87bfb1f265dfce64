// generate.cpp — text from a byte-level GPT: greedy or temperature sampling with top-k (see train.h).
#include <limits>

#include "slimshard/common.h"
#include "slimshard/train.h"

namespace slimshard {

std::string generate_text(Model& model, const GenerateOptions& g) {
  if (model.config().arch != "gpt" || model.config().vocab < 256)
    throw UsageError("generate: needs a byte-level GPT (vocab >= 256)");
  at::NoGradGuard no_grad;
  at::Generator gen = at::detail::createCPUGenerator(g.seed);
  std::vector<int64_t> ids;
  for (unsigned char c : g.prompt) ids.push_back(c);
  if (ids.empty()) ids.push_back('\n');
  const int64_t T = model.config().seq_len;
  std::string out = g.prompt;
  for (int64_t i = 0; i < g.tokens; ++i) {
    const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(ids.size()) - T);
    at::Tensor ctx = at::tensor(std::vector<int64_t>(ids.begin() + start, ids.end()), at::kLong).unsqueeze(0);
    at::Tensor logits = model.logits(ctx).select(1, ctx.size(1) - 1).squeeze(0);
    if (g.temperature <= 0) {
      ids.push_back(logits.argmax().item<int64_t>());
    } else {
      logits = logits / g.temperature;
      if (g.top_k > 0 && g.top_k < logits.size(0)) {
        at::Tensor kth = std::get<0>(logits.topk(g.top_k)).select(0, g.top_k - 1);
        logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
      }
      ids.push_back(at::multinomial(logits.softmax(-1), 1, false, gen).item<int64_t>());
    }
    const int64_t tok = ids.back();
    out.push_back(tok < 256 ? static_cast<char>(tok) : '?');
  }
  return out;
}

}  // namespace slimshard
