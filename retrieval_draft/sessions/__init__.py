"""What outlives one call.

- ``memory``: ``PluginMemory``, what calls remember per model (cost curve, learned rates, history, stores,
  prefix cache), one explicit object; below the plugin, which reads it.
- ``session``: a loaded model, its tokenizer and drafters generating request after request (the CLI's
  and the tools' way in); above the plugin, which it calls.
"""
