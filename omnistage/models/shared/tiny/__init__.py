"""Random-weight parts that several families' tiny fixtures are built from (tokenizers trained locally,
toy-size encoders and VAEs), each in the module of the model it imitates."""
