//! The sharing-safety quantity (HiveD Theorem 1) as an explicit check: free physical cells per
//! level, cascaded top-down through splits, must cover the cells still owed to VCs.

/// Walks a chain from its top level down. `free[l]`/`owed[l]` are indexed by level number
/// (1..=top), `fanout[l]` is children per level-`l` cell. Returns the first level (highest
/// first) where owed cells exceed what the free cells can give, with the shortfall.
pub(crate) fn cascade(
    top: u8,
    fanout: &[u32],
    free: &[i64],
    owed: &[i64],
) -> Result<(), (u8, i64)> {
    let mut spare: i64 = 0;
    for l in (1..=top as usize).rev() {
        if l < top as usize {
            spare = spare.saturating_mul(fanout[l + 1] as i64);
        }
        spare += free[l] - owed[l];
        if spare < 0 {
            return Err((l as u8, -spare));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spare_top_cells_split_to_cover_lower_levels() {
        // 2 levels, 4 GPUs per top cell; one free top cell.
        let fanout = [0, 1, 4];
        assert!(cascade(2, &fanout, &[0, 0, 1], &[0, 4, 0]).is_ok());
        assert_eq!(cascade(2, &fanout, &[0, 0, 1], &[0, 5, 0]), Err((1, 1)));
        assert_eq!(cascade(2, &fanout, &[0, 0, 1], &[0, 1, 1]), Err((1, 1)));
        assert_eq!(cascade(2, &fanout, &[0, 3, 0], &[0, 0, 1]), Err((2, 1)));
        // Free low cells never cover a higher-level debt.
        assert!(cascade(2, &fanout, &[0, 3, 1], &[0, 3, 1]).is_ok());
    }
}
