//! Cluster placement of offline work beside online services: speed predictor, Kuhn-Munkres matching, HiveD cells.
