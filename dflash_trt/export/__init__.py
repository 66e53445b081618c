"""ONNX export of the target and drafter graphs (plugin and portable flavours). Not built yet: see the export issue."""
