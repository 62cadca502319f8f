// attnforge export: a checkpoint as a directory another framework loads
// without attnforge.
//
//   --format pytorch   DIR/model.safetensors  the model's state dict (our names, f32)
//                      DIR/config.json        the model keys of the resolved recipe, the
//                                             model card (train/card.h), the source and version
//                      DIR/model.py           plain PyTorch (torch only) that rebuilds the model
//                                             from config.json, every attention mechanism written
//                                             from docs/ATTENTION.md, and loads the weights:
//                                               import model; m = model.load("DIR")
//                                               logits = m(x)    (m(src, tgt): encoder_decoder)
//   --format timm      softmax ViTs as timm's VisionTransformer holds them:
//                      DIR/model.safetensors  timm's names (blocks.L.attn.qkv: the rows of
//                                             to_q, to_k, to_v stacked; norm1, attn.proj, norm2,
//                                             mlp.fc1, mlp.fc2, norm)
//                      DIR/config.json        as above, plus "timm": {"model_name", "kwargs"}:
//                        m = timm.create_model(model_name, **kwargs)
//                        m.load_state_dict(state_dict, strict=True)
// The directory is built beside DIR and renamed into place: an existing DIR
// is never overwritten. Every model type exports to pytorch; an option model.py
// does not rebuild (attend_axially, the dual encoder) is refused naming the
// recipe key.
#pragma once

#include <string>
#include <vector>

namespace forge::train {

struct ExportRequest {
  std::string checkpoint;  // any form resolve_checkpoint accepts
  std::string out_dir;
  std::string format = "pytorch";  // or "timm"
  bool ema = false;                // the moving average of the weights (ema.decay)
  // Replace an existing out_dir, which must hold an earlier export's files
  // only (model.safetensors, config.json, model.py); else it is refused.
  bool overwrite = false;
};

struct ExportResult {
  std::string checkpoint;  // the checkpoint directory exported
  std::string dir;
  int64_t tensors = 0;
};

ExportResult export_checkpoint(const ExportRequest& request);

// The text of model.py (train/pytorch_model.py, built into the program).
const char* pytorch_model_source();

}  // namespace forge::train
