"""The Higgs Audio v2 audio tokenizer without torchaudio: ``decoder.py`` (codes -> 24 kHz audio) and
``encoder.py`` (a reference clip -> codes). Higgs Audio v2 and OmniVoice both speak through it."""
