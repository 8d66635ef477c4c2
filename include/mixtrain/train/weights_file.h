// Weights only, as Keras' model.save_weights() / model.load_weights(): one safetensors file holding every
// weight of a model under its path ("hidden/kernel" F32 (in, units), in the variable dtype, model order).
// Unlike a checkpoint (train/checkpoint.h) it carries no optimizer or random state: it moves trained weights
// into another model (a freshly built one in the same process, a model for inference, a model that shares
// some layers) rather than resuming a fit().
//
//   save_weights(model, "mlp.weights.safetensors");
//   Model fresh = ...;                                  // built the same way, any time, in any process
//   load_weights(fresh, "mlp.weights.safetensors");
//
// __metadata__: "format" = "mixtrain-weights-1", "layers" (comma-separated), "input_shape" (JSON array).
#pragma once

#include <string>
#include <vector>

namespace mixtrain {

class Model;

// The "format" metadata of the files save_weights() writes.
inline constexpr const char* kWeightsFormat = "mixtrain-weights-1";

// Writes every weight of the model (trainable or not) by its path, atomically (see save_safetensors).
// Error when the model is not built (it has no weights yet) or a weight has no name; kIo when the file
// cannot be written.
void save_weights(const Model& model, const std::string& path);

// What load_weights() did: weight paths of the model that received a value, and those left as they were
// (with the reason), in model order.
struct LoadWeightsReport {
  std::vector<std::string> loaded;
  std::vector<std::string> skipped;  // "<path>: <why>"
};

// Reads a file written by save_weights() (a checkpoint's weights, or any safetensors file of weights by
// path) into the model, converting floating dtypes to each variable's dtype. The whole file is checked
// before any weight changes, so an Error leaves the model as it was; every error names the file and the
// weight. An unbuilt model is built first for the file's "input_shape".
//  by_name = false (Keras' default): the file's weights in order, one for each model weight in order, so
//    layer names need not match; the counts must be equal.
//  by_name = true: each model weight takes the file's entry with the same path; model weights the file
//    lacks keep their values (listed as skipped), entries no model weight has are ignored.
//  skip_mismatch: a weight whose shape differs from the file's is skipped with a warning on stderr
//    (as Keras') instead of failing the load.
LoadWeightsReport load_weights(Model& model, const std::string& path, bool by_name = false,
                               bool skip_mismatch = false);

}  // namespace mixtrain
