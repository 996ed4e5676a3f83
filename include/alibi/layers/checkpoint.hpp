// SPDX-License-Identifier: MIT
// Loading and saving a module's parameters through safetensors files.
#pragma once

#include <string>

#include "alibi/error.hpp"
#include "alibi/layers/ops.hpp"
#include "alibi/safetensors.hpp"

namespace alibi {

namespace detail {

/// load_parameters for any file type with contains / info / to_float / origin.
template <class Isa, class Module, class File>
void load_parameters_from(Module& module, const File& file, const std::string& prefix) {
  for (const auto& p : module.parameters()) {
    const std::string full = prefix + p.name;
    const std::string expected = detail::shape_text(p.shape);
    if (!file.contains(full))
      detail::raise(error("alibi::load_parameters: " + file.origin() + " has no tensor '" + full +
                          "' (expected shape " + expected + ")"));
    const safetensors::tensor_info& t = file.info(full);
    if (t.shape != p.shape)
      detail::raise(error("alibi::load_parameters: tensor '" + full + "' in " + file.origin() +
                          " has shape " + detail::shape_text(t.shape) + ", expected " + expected));
    module.set(p.name, file.template to_float<Isa>(full).data(), p.shape);
  }
}

}  // namespace detail

/// Sets every parameter of `module` (multi_head_attention, transformer_layer) from the
/// tensors `prefix + name` of `file`. A missing tensor or one of another shape is an
/// alibi::error naming it; tensors the module does not use are ignored.
template <class Module, class Isa = detail::isa_tag>
void load_parameters(Module& module, const safetensors& file, const std::string& prefix = "") {
  detail::load_parameters_from<Isa>(module, file, prefix);
}

/// The same from a sharded checkpoint (model.safetensors.index.json): each tensor is read
/// from the shard the index names.
template <class Module, class Isa = detail::isa_tag>
void load_parameters(Module& module, const sharded_safetensors& file,
                     const std::string& prefix = "") {
  detail::load_parameters_from<Isa>(module, file, prefix);
}

/// Adds every parameter of `module` to `writer` as `prefix + name` (F32).
template <class Module>
void save_parameters(const Module& module, safetensors_writer& writer,
                     const std::string& prefix = "") {
  for (const auto& p : module.parameters())
    writer.add(prefix + p.name, p.shape, module.get(p.name));
}

}  // namespace alibi
