// Price after a percentage discount: discountPrice(80, 25) === 60.
export function discountPrice(price, percent) {
  return price - percent;
}
