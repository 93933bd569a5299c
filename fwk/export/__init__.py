"""`fwk export`, which turns a trained run into a folded, optimized and quantized ONNX model.

Every stage is verified. There is one module per stage, run in this order by ``pipeline.py``:

    source    the run's config and newest complete checkpoint -> the eval-mode torch model
    fold      BatchNorms folded into the convolutions before them
    to_onnx   torch.onnx with the dynamo exporter: one .onnx file, dynamic batch axis, checked
    optimize  onnxscript's graph optimizer: constant folding, dead code, redundant ops
    quantize  onnxruntime.quantization: static QDQ int8, dynamic int8, or fp16
    qat       --qat-steps: fake-int8 fine-tune through the engine (retrain), then static int8
              with the learned ranges, written as int8-qat.onnx beside PTQ's int8.onnx
    verify    accuracy / loss, agreement and output differences on the validation set, and latency
    report    the table on screen and export_report.json, with the verdict and the recommendation

Only this package reads the ``export`` config group, ``ExportConfig``.
"""
