"""Exporting a trained DBNet: ONNX export, onnxruntime inference and int8 quantisation, the parity
check between backends, and the export command's settings."""
