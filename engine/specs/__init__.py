"""Annotator specs: the parameters of a template annotator (`templates.AnnotatorSpec`), the readable source emitted
from them, and the surface features (links, digits, capitals, ...) that source may test (`surface`)."""
