"""`fwk export`, which turns a trained run into a verified model file: by default a folded,
optimized and quantized ONNX model; ``--format`` picks another (``formats/``, one module each).

Every stage is verified. There is one module per stage, run in this order by ``pipeline.py``:

    source    the run's config and newest complete checkpoint -> the eval-mode torch model
    fold      BatchNorms folded into the convolutions before them
    capture   torch.export of the folded model, dynamic batch axis (and seq for language models)
    to_onnx   torch.onnx with the dynamo exporter: one .onnx file, dynamic batch axis, checked
    optimize  onnxscript's graph optimizer: constant folding, dead code, redundant ops
    quantize  onnxruntime.quantization: static QDQ int8, dynamic int8, or fp16
    qat       --qat-steps: fake-int8 fine-tune through the engine (retrain), then static int8
              with the learned ranges, written as int8-qat.onnx beside PTQ's int8.onnx
    verify    accuracy / loss, agreement and output differences on the validation set, and latency
    report    the table on screen and export_report.json, with the verdict and the recommendation

``--format pt2`` and ``aoti`` take source, fold and capture, then save the program or compile it
ahead of time (``program.py``), checked in a fresh process (``reload.py``); ``weights.py``
writes and checks the formats that are not ONNX.

Only this package reads the ``export`` config group, ``ExportConfig``.
"""
