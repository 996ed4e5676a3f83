// SPDX-License-Identifier: MIT
// Loading and saving a module's parameters through safetensors files.
#pragma once

#include <string>

#include "alibi/error.hpp"
#include "alibi/layers/ops.hpp"
#include "alibi/safetensors.hpp"

namespace alibi {

/// Sets every parameter of `module` (multi_head_attention, transformer_layer) from the
/// tensors `prefix + name` of `file`. A missing tensor or one of another shape is an
/// alibi::error naming it; tensors the module does not use are ignored.
template <class Module>
void load_parameters(Module& module, const safetensors& file, const std::string& prefix = "") {
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
    module.set(p.name, file.to_float(full).data(), p.shape);
  }
}

/// Adds every parameter of `module` to `writer` as `prefix + name` (F32).
template <class Module>
void save_parameters(const Module& module, safetensors_writer& writer,
                     const std::string& prefix = "") {
  for (const auto& p : module.parameters())
    writer.add(prefix + p.name, p.shape, module.get(p.name));
}

}  // namespace alibi
