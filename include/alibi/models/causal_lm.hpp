// SPDX-License-Identifier: MIT
// causal_lm<T, Backend, S>: a decoder-only model of an ALiBi family (BLOOM, MPT,
// Baichuan-13B and Baichuan2-13B, Falcon-RW) with its KV caches inside: token embedding, the
// embedding norm where the family has one, the layers, the final norm and the output head
// (its own or tied to the embedding); prefill and decode give each sequence's next-token
// logits. Causal by construction: no call takes a mask.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "alibi/backend/eigen/attention.hpp"
#include "alibi/backend/eigen/layers.hpp"
#include "alibi/core/error.hpp"
#include "alibi/core/tensor_view.hpp"
#include "alibi/layers/kv_cache.hpp"
#include "alibi/layers/norm.hpp"
#include "alibi/layers/transformer_layer.hpp"
#include "alibi/models/checkpoint.hpp"
#include "alibi/models/families.hpp"
#include "alibi/models/layer_instances.hpp"

namespace alibi {

/// A decoder-only ALiBi model of `family`, on a CPU backend (host memory), with activations of
/// type T and KV caches storing S (kv_cache). Use it as an engine would:
///
///     auto lm = alibi::causal_lm<>::from_directory("bloom-560m");  // config.json + safetensors
///     lm.start(batch, capacity);                                    // the caches
///     lm.prefill(prompts, lengths, logits);                          // logits (batch, vocab)
///     lm.decode(next_tokens, logits);                                // one token per sequence
///
/// Every forward is causal (the family is a decoder), and each call is all or nothing: a call
/// that fails (a bad token, a full cache, std::bad_alloc) leaves every layer's cache as it was.
/// A family with normalized_head (Baichuan2) divides each head row by its L2 norm as it is
/// set, as Baichuan2's NormHead does before its first inference.
template <class T = float, class Backend = backend::eigen, class S = T>
class causal_lm {
  static_assert(detail::reads_host_memory<Backend>,
                "alibi::causal_lm: the CPU backends (eigen, reference); on CUDA, drive the "
                "transformer_layer objects and their caches directly");
  using cache_type = kv_cache<T, Backend, S>;

 public:
  /// A model of `family` with `vocab` tokens, every parameter at its initial value (set them
  /// through layer(), embedding_norm(), final_norm(), set_embedding() and set_output_head()).
  causal_lm(model_family family, index_t vocab, const Backend& backend = Backend{})
      : backend_(backend),
        family_(std::move(family)),
        vocab_(vocab),
        embedding_norm_(family_.norm(), backend),
        final_norm_(family_.norm(), backend) {
    const index_t E = family_.layer.attention.embed_dim;
    if (vocab <= 0 || family_.num_layers <= 0)
      detail::raise(
          argument_error("alibi::causal_lm: vocab and family.num_layers must be > 0, got " +
                         detail::str(vocab) + " and " + detail::str(family_.num_layers)));
    if (detail::checked_product({vocab, E, static_cast<index_t>(sizeof(T))}) < 0)
      detail::raise(argument_error("alibi::causal_lm: vocab * embed_dim (" + detail::str(vocab) +
                                   " * " + detail::str(E) +
                                   ") does not fit in 64-bit byte counts"));
    if (static_cast<std::uint64_t>(family_.num_layers) > layers_.max_size())
      detail::raise(argument_error("alibi::causal_lm: family.num_layers (" +
                                   detail::str(family_.num_layers) +
                                   ") is more than a vector holds"));
    layers_.reserve(static_cast<std::size_t>(family_.num_layers));
    for (index_t i = 0; i < family_.num_layers; ++i) layers_.emplace_back(family_.layer, backend);
    embedding_.assign(static_cast<std::size_t>(vocab * E), T(0));
  }

  /// The model in a checkpoint (a safetensors or sharded_safetensors file) of `family`: every
  /// layer, the norms, the embedding (its rows give the vocabulary) and lm_head.weight (also
  /// looked for under the checkpoint's outer prefixes), or the embedding where the checkpoint
  /// has no head (tied: BLOOM, MPT, Falcon-RW; a family with own_head must have one).
  template <class File>
  causal_lm(const File& file, const model_family& family, const Backend& backend = Backend{})
      : causal_lm(family, embedding_rows(file, family), backend) {
    const std::string root = family_root(file, family_);
    for (index_t i = 0; i < family_.num_layers; ++i)
      load_family_layer(layers_[static_cast<std::size_t>(i)], file, family_, i);
    if (!family_.embedding_norm.empty())
      load_parameters(embedding_norm_, file, root + family_.embedding_norm + ".");
    load_parameters(final_norm_, file, root + family_.final_norm + ".");
    set_embedding(file.to_float(root + family_.embedding + ".weight").data());
    // The head sits beside the family's root ("model." for Baichuan), under the outer prefix
    // a fine-tuning tool added, or under the root itself.
    const std::string outer =
        root.size() >= family_.root.size() && root.compare(root.size() - family_.root.size(),
                                                           std::string::npos, family_.root) == 0
            ? root.substr(0, root.size() - family_.root.size())
            : root;
    std::vector<std::string> names;
    for (const std::string& n : {std::string(), outer, root})
      if (std::find(names.begin(), names.end(), n + "lm_head.weight") == names.end())
        names.push_back(n + "lm_head.weight");
    std::string tried;
    for (const std::string& name : names) {
      if (!file.contains(name)) {
        tried += (tried.empty() ? "'" : ", '") + name + "'";
        continue;
      }
      const safetensors::tensor_info& head = file.info(name);
      const index_t E = embed_dim();
      if (head.shape.size() != 2 || head.shape[0] != vocab_ || head.shape[1] != E)
        detail::raise(argument_error("alibi::causal_lm: " + name + " must have shape (" +
                                     detail::str(vocab_) + ", " + detail::str(E) + "), got " +
                                     detail::shape_text(head.shape)));
      set_output_head(file.to_float(name).data());
      return;
    }
    if (family_.own_head)
      detail::raise(io_error("alibi::causal_lm: " + file.origin() +
                             " has no output head: " + family_.name +
                             " models have one of their own (none of " + tried + " is in it)"));
  }

  /// The model in a checkpoint folder: config.json (families::from_config) and
  /// model.safetensors or model.safetensors.index.json.
  static causal_lm from_directory(const std::string& dir, const Backend& backend = Backend{}) {
    const std::string base = dir.empty() || dir.back() == '/' ? dir : dir + "/";
    const model_family family = families::from_config_file(base + "config.json");
    std::FILE* index = std::fopen((base + "model.safetensors.index.json").c_str(), "rb");
    if (index != nullptr) {
      std::fclose(index);
      return causal_lm(sharded_safetensors::open(base + "model.safetensors.index.json"), family,
                       backend);
    }
    return causal_lm(safetensors::read(base + "model.safetensors"), family, backend);
  }

  const model_family& family() const { return family_; }
  index_t vocab() const { return vocab_; }
  index_t embed_dim() const { return family_.layer.attention.embed_dim; }
  index_t num_layers() const { return family_.num_layers; }
  transformer_layer<T, Backend>& layer(index_t i) { return layers_[layer_index(i)]; }
  const transformer_layer<T, Backend>& layer(index_t i) const { return layers_[layer_index(i)]; }
  norm_layer<T, Backend>& embedding_norm() { return embedding_norm_; }
  norm_layer<T, Backend>& final_norm() { return final_norm_; }
  /// The token embedding from (vocab, embed_dim) floats, row-major.
  void set_embedding(const float* data) {
    require_data("set_embedding", data);
    std::copy_n(data, embedding_.size(), embedding_.begin());
  }
  /// An output head of its own, (vocab, embed_dim) floats, row-major; until then the head is
  /// the embedding (tied). With the family's normalized_head, each row is divided by
  /// max(its L2 norm, 1e-12) (summed in double), as torch's F.normalize does.
  void set_output_head(const float* data) {
    require_data("set_output_head", data);
    std::vector<T> head(data, data + embedding_.size());
    if (family_.normalized_head) {
      const index_t E = embed_dim();
      for (index_t t = 0; t < vocab_; ++t) {
        T* r = head.data() + t * E;
        double sq = 0.0;
        for (index_t e = 0; e < E; ++e) sq += static_cast<double>(r[e]) * r[e];
        const double inv = 1.0 / std::max(std::sqrt(sq), 1e-12);
        for (index_t e = 0; e < E; ++e) r[e] = static_cast<T>(r[e] * inv);
      }
    }
    head_ = std::move(head);
  }
  bool tied_head() const { return head_.empty(); }

  /// Starts `batch` sequences, each with room for `capacity` tokens: a fresh cache per layer
  /// (what the caches held before is dropped).
  void start(index_t batch, index_t capacity) {
    std::vector<cache_type> caches;
    caches.reserve(layers_.size());
    for (const auto& l : layers_) caches.push_back(cache_type::for_module(l, batch, capacity));
    caches_ = std::move(caches);
  }
  /// Tokens sequence b holds (its prompt and the decoded tokens so far).
  index_t length(index_t b) const { return caches().front().length(b); }
  /// Rolls sequence b back to its first `length` tokens in every layer's cache (e.g. rejected
  /// draft tokens).
  void truncate(index_t b, index_t length) {
    for (cache_type& c : caches()) c.truncate(b, length);
  }
  /// Empties sequence b in every layer's cache (its slot starts a new sequence).
  void clear(index_t b) {
    for (cache_type& c : caches()) c.clear(b);
  }
  /// The layers' caches (one per layer, in order). Changed one by one, they must be left
  /// holding the same lengths (prefill and decode refuse them otherwise): truncate() and
  /// clear() above change them all.
  std::vector<cache_type>& caches() {
    if (caches_.empty())
      detail::raise(argument_error("alibi::causal_lm: call start(batch, capacity) first"));
    return caches_;
  }
  const std::vector<cache_type>& caches() const {
    if (caches_.empty())
      detail::raise(argument_error("alibi::causal_lm: call start(batch, capacity) first"));
    return caches_;
  }

  /// Appends tokens (batch, n) to the sequences, of which the first lengths(b) of row b are
  /// sequence b's (default: all n; 0: the sequence sits this call out), and writes each
  /// sequence's logits for its next token, those of its last new token, to logits (batch,
  /// vocab); the rows of sequences without new tokens are left as they are.
  void prefill(tensor_view<const std::int32_t, 2> tokens, tensor_view<const index_t, 1> lengths,
               tensor_view<float, 2> logits) {
    step("alibi::causal_lm::prefill", tokens, lengths, logits);
  }
  void prefill(tensor_view<const std::int32_t, 2> tokens, tensor_view<float, 2> logits) {
    step("alibi::causal_lm::prefill", tokens, {}, logits);
  }
  /// One new token per sequence (batch): logits (batch, vocab) for the token after it.
  void decode(tensor_view<const std::int32_t, 1> tokens, tensor_view<float, 2> logits) {
    const auto t2 = make_strided_view<const std::int32_t, 2>(tokens.data, {tokens.extents[0], 1},
                                                             {tokens.strides[0], 1});
    step("alibi::causal_lm::decode", t2, {}, logits);
  }

 private:
  template <class File>
  static index_t embedding_rows(const File& file, const model_family& family) {
    const std::string root = family_root(file, family);
    // The checkpoint's layers are exactly family.num_layers: a config with fewer would load a
    // truncated model without a word (and a huge count would be allocated before a layer is
    // read).
    if (family.num_layers > 0) {
      const std::string last = detail::layer_probe(family, family.num_layers - 1, root);
      const std::string next = detail::layer_probe(family, family.num_layers, root);
      const std::string count = detail::str(family.num_layers);
      if (!file.contains(last))
        detail::raise(io_error("alibi::causal_lm: the family has num_layers = " + count + " but " +
                               file.origin() + " has no '" + last + "'"));
      if (file.contains(next))
        detail::raise(io_error("alibi::causal_lm: " + file.origin() +
                               " holds more layers than "
                               "the family's num_layers = " +
                               count + " (it has '" + next +
                               "'); the config's layer count (n_layer, n_layers or "
                               "num_hidden_layers) must be the checkpoint's"));
    }
    const std::string name = root + family.embedding + ".weight";
    if (!file.contains(name))
      detail::raise(
          argument_error("alibi::causal_lm: the checkpoint has no token embedding '" + name + "'"));
    const safetensors::tensor_info& t = file.info(name);
    if (t.shape.size() != 2 || t.shape[1] != family.layer.attention.embed_dim)
      detail::raise(argument_error("alibi::causal_lm: '" + name + "' must have shape (vocab, " +
                                   detail::str(family.layer.attention.embed_dim) + "), got " +
                                   detail::shape_text(t.shape)));
    return t.shape[0];
  }

  static void require_data(const char* fn, const float* data) {
    if (data == nullptr)
      detail::raise(
          argument_error(std::string("alibi::causal_lm::") + fn + ": data must not be null"));
  }

  std::size_t layer_index(index_t i) const {
    if (i < 0 || i >= num_layers())
      detail::raise(argument_error("alibi::causal_lm::layer: i must be in [0, " +
                                   detail::str(num_layers()) + "), got " + detail::str(i)));
    return static_cast<std::size_t>(i);
  }

  void step(const char* fn, tensor_view<const std::int32_t, 2> tokens,
            tensor_view<const index_t, 1> lengths, tensor_view<float, 2> logits) {
    using detail::str;
    const std::string f = fn;
    std::vector<cache_type>& cs = caches();
    const index_t B = tokens.extents[0], n = tokens.extents[1], E = embed_dim();
    // Every layer must hold each sequence at one length: a cache truncated alone would put
    // the new tokens at other positions in its layer.
    for (std::size_t l = 1; l < cs.size(); ++l)
      for (index_t b = 0; b < cs.front().batch(); ++b)
        if (cs[l].length(b) != cs.front().length(b))
          detail::raise(argument_error(
              f + ": the layers' caches hold sequence " + str(b) +
              " at different lengths (layer 0: " + str(cs.front().length(b)) + ", layer " +
              str(static_cast<index_t>(l)) + ": " + str(cs[l].length(b)) +
              "); change them alike (causal_lm::truncate, clear)"));
    if (B != cs.front().batch() || n < 0)
      detail::raise(argument_error(f +
                                   ": tokens must have shape (batch = " + str(cs.front().batch()) +
                                   ", n), got (" + str(B) + ", " + str(n) + ")"));
    if (B > 0 && n > 0 && tokens.data == nullptr)
      detail::raise(argument_error(f + ": tokens.data must not be null"));
    if (logits.extents[0] != B || logits.extents[1] != vocab_ || logits.data == nullptr)
      detail::raise(argument_error(f + ": logits must have shape (" + str(B) + ", " + str(vocab_) +
                                   "), got (" + str(logits.extents[0]) + ", " +
                                   str(logits.extents[1]) + ")" +
                                   (logits.data == nullptr ? " with null data" : "")));
    // Valid tokens per sequence, each checked: a token outside the vocabulary would read
    // past the embedding.
    std::vector<index_t> len(static_cast<std::size_t>(B), n);
    if (lengths.data != nullptr || lengths.extents[0] != 0) {
      if (lengths.extents[0] != B || lengths.data == nullptr)
        detail::raise(argument_error(
            f + ": lengths must have shape (" + str(B) + "), got (" + str(lengths.extents[0]) +
            ")" +
            (lengths.data == nullptr ? " with null data (omit it: default-construct it)" : "")));
      for (index_t b = 0; b < B; ++b) {
        if (lengths(b) < 0 || lengths(b) > n)
          detail::raise(argument_error(f + ": lengths(" + str(b) + ") must be in [0, " + str(n) +
                                       "], got " + str(lengths(b))));
        len[static_cast<std::size_t>(b)] = lengths(b);
      }
    }
    for (index_t b = 0; b < B; ++b)
      for (index_t i = 0; i < len[static_cast<std::size_t>(b)]; ++i)
        if (tokens(b, i) < 0 || tokens(b, i) >= vocab_)
          detail::raise(argument_error(f + ": tokens(" + str(b) + ", " + str(i) +
                                       ") must be in [0, " + str(vocab_) + "), got " +
                                       str(tokens(b, i))));
    if (B == 0 || n == 0) return;

    // x (B, n, E): the new tokens' embeddings; rows past a sequence's length hold 0.
    x_.assign(static_cast<std::size_t>(B * n * E), T(0));
    for (index_t b = 0; b < B; ++b)
      for (index_t i = 0; i < len[static_cast<std::size_t>(b)]; ++i)
        std::copy_n(embedding_.begin() + tokens(b, i) * E, E, x_.begin() + (b * n + i) * E);
    const auto xv = make_view(x_.data(), B, n, E);
    forward_options opt;
    opt.mask.causal = true;
    opt.q_lengths = make_view<const index_t>(len.data(), B);
    // All layers' appends are one step: a failure in any layer returns every cache.
    std::deque<typename cache_type::transaction> appends;
    for (cache_type& c : cs) appends.emplace_back(c);
    if (!family_.embedding_norm.empty()) embedding_norm_.forward(xv, xv);
    for (std::size_t l = 0; l < layers_.size(); ++l) layers_[l].forward(xv, xv, cs[l], opt);
    final_norm_.forward(xv, xv);
    // logits (rows, vocab) = h (rows, E) head^T, h the last new token of each sequence that
    // has one: one projection on the backend's threads (the layers' linear).
    std::vector<index_t> with_tokens;
    for (index_t b = 0; b < B; ++b)
      if (len[static_cast<std::size_t>(b)] > 0) with_tokens.push_back(b);
    const index_t rows = static_cast<index_t>(with_tokens.size());
    std::vector<T> h(static_cast<std::size_t>(rows * E));       // (rows, E)
    std::vector<T> y(static_cast<std::size_t>(rows * vocab_));  // (rows, vocab)
    for (index_t r = 0; r < rows; ++r) {
      const index_t b = with_tokens[static_cast<std::size_t>(r)];
      std::copy_n(x_.begin() + (b * n + len[static_cast<std::size_t>(b)] - 1) * E, E,
                  h.begin() + r * E);
    }
    detail::layer_ops<Backend>::template linear<T>(
        backend_, h.data(), E, rows, E, tied_head() ? embedding_.data() : head_.data(), nullptr,
        vocab_, y.data(), vocab_, false, nullptr);
    for (index_t r = 0; r < rows; ++r)
      for (index_t t = 0; t < vocab_; ++t)
        logits(with_tokens[static_cast<std::size_t>(r)], t) = static_cast<float>(y[r * vocab_ + t]);
    for (auto& a : appends) a.commit();
  }

  Backend backend_;
  model_family family_;
  index_t vocab_;
  std::vector<transformer_layer<T, Backend>> layers_;
  norm_layer<T, Backend> embedding_norm_, final_norm_;
  std::vector<T> embedding_;        // (vocab, embed_dim)
  std::vector<T> head_;             // (vocab, embed_dim), or empty: tied to the embedding
  std::vector<cache_type> caches_;  // one per layer
  std::vector<T> x_;                // (batch, n, embed_dim) activations of a call
};

}  // namespace alibi

// With alibi::kernels built with the safetensors reader, the float models are compiled in the
// library (causal_lm_instances.inc): a file using one compiles only its calls.
#if defined(ALIBI_PRECOMPILED_MODELS)
namespace alibi {
#define ALIBI_INSTANCE(...) extern template __VA_ARGS__;
#include "alibi/models/causal_lm_instances.inc"
#undef ALIBI_INSTANCE
}  // namespace alibi
#endif
